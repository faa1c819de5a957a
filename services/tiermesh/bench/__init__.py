"""`tiermesh bench`: a load generator for the mesh, its scenarios, reports and plots.

Pure modules (workload, arrivals, stats, ladder, compare, report) decide and summarise;
`calls` is the only one that speaks tritonclient; `runner` only moves requests and
records; `session` wires one run from its config to a report directory.
"""
