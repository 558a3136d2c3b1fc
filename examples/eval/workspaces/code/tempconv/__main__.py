"""The command line: python -m tempconv VALUE UNIT (UNIT is C or F)."""

import argparse

from tempconv.convert import c_to_f, f_to_c

parser = argparse.ArgumentParser(prog="tempconv")
parser.add_argument("value", type=float)
parser.add_argument("unit", choices=["C", "F"])
args = parser.parse_args()
# TODO: accept K as a unit too
if args.unit == "C":
    print(c_to_f(args.value), "F")
else:
    print(f_to_c(args.value), "C")
