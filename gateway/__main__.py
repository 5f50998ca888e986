"""`python -m gateway` is the `voltgate` command."""

from gateway.cli import main

main()
