"""The host's control plane: jobs, their supervisor, executors (local and Slurm) and status.

Standard library only, and light to import: `deploy`, `launch`, `status`, `logs` and
`stop` run under ``python -S`` on a host where nothing is installed (see `remote`).
"""
