"""Apps that ship with the project: the paper's workloads (`builtin`)."""
