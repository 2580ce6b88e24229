"""Plain Python that every side uses: the command-line flags helper (a dataclass's fields become flags, the
environment and a file fill them) and reading corpus files. Imports nothing of ours."""
