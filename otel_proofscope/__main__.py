import sys

from otel_proofscope.cli import main

sys.exit(main())
