"""The command-line tools: the binary, export, report, new, launch."""
