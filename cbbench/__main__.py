"""`python -m cbbench`: the CLI through this interpreter, for the scripts under results/ that
must run the cbbench of the Python running them whatever is on PATH."""

from cbbench.cli.app import main

main()
