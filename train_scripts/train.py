#!/usr/bin/env python3
"""``timm-recursive-train`` as a script: see ``timm_recursive/train/commands/train.py``."""
import sys

from timm_recursive.train.commands.train import main

if __name__ == '__main__':
    sys.exit(main())
