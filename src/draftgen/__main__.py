import sys

from draftgen.cli import main

sys.exit(main())
