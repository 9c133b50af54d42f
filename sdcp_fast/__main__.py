import sys

from sdcp_fast.cli import main

sys.exit(main())
