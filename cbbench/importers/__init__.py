"""Other benchmark tools' per-request output as cbbench results (`cbbench import`), so that
compare, gate, report and export read them as they read cbbench's own runs."""
