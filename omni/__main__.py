"""`python -m omni` runs the server, as bin/omni-serve does."""

from omni.cli.main import main

if __name__ == "__main__":
    main()
