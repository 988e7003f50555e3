#!/usr/bin/env python3
"""``timm-recursive-probe`` as a script: see ``timm_recursive/cli/probe.py``."""
import sys

from timm_recursive.cli.probe import main

if __name__ == '__main__':
    sys.exit(main())
