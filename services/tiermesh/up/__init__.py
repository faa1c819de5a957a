"""`tiermesh up`: the whole mesh on one machine, each service its own process."""
