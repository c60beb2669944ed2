import sys

from bert_repro.convert.cli import main

sys.exit(main())
