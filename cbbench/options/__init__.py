"""Typed option groups, one per concern, like EngineArgs (engine/args.py): each field carries
its type, default, help and checks, every command's flags are derived from them
(:func:`with_options`), and each group validates once, in its ``validate()``.

- load.py: what to send and when (LoadOptions; ProbeOptions for sweep and capacity)
- endpoint.py: where HTTP requests go and how (EndpointFlags)
- output.py: what is judged and written (OutputOptions), and which window is read (WindowOptions)
- serve.py: how `cbbench serve` listens (ServeOptions)
- engine.py: EngineArgs as a group (its own metadata, its own validate())
"""

from cbbench.options.endpoint import PROBE_ENDPOINT, EndpointFlags
from cbbench.options.engine import ENGINE_PANEL, engine_group
from cbbench.options.fields import REQUIRED, Group, check_fields, opt, with_options
from cbbench.options.load import FIXED_LENGTHS_WORKLOAD_HELP, PROBE_LOAD, LoadOptions, ProbeOptions
from cbbench.options.output import (
    READ_OUTPUT,
    RUN_OUTPUT,
    OutputOptions,
    WindowOptions,
    output_file,
)
from cbbench.options.serve import ServeOptions

__all__ = [
    "ENGINE_PANEL", "FIXED_LENGTHS_WORKLOAD_HELP", "PROBE_ENDPOINT", "PROBE_LOAD", "engine_group", "REQUIRED", "RUN_OUTPUT", "EndpointFlags", "Group",
    "LoadOptions", "OutputOptions", "READ_OUTPUT", "ProbeOptions", "ServeOptions", "WindowOptions",
    "check_fields",
    "output_file", "opt", "with_options",
]
