"""Independent numpy oracle for ropekv (see oracle.py)."""
from .oracle import *  # noqa: F401,F403
from .oracle import (DEFAULTS, FORMATS, FP8, NP_DTYPES, Format, convert_nope, encode,  # noqa: F401
                     expected_outputs, float32_from_decimal, load_golden, parse_repro,
                     round_double_eval_to_format, round_exact_to_format,
                     round_fraction_to_format, rope_pairs, rope_round)
