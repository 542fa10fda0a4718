#!/usr/bin/env python3
"""UCI Census-Income (KDD) lines (42 fields joined by ", ") to oar's slot format, for MMoE and
PLE as PaddleRec and keras-mmoe train them: two labels, income over 50,000 (`income`) and never
married (`marital`); the 11 numeric columns as one dense column (`num`, raw: the job file
standardizes them); the 29 categorical columns as one-id slots named after the column,
each value hashed (CRC-32 of its text), so no vocabulary is needed. Reads the file as UCI ships it,
gzip-compressed or not.

    pipe_command = "python3 examples/readers/census.py"   # from the repository root

A line with other than 42 fields is an error naming its number (oar reports the pipe's failure).
"""
import gzip
import io
import sys
import zlib

NAMES = (
    "age class_worker det_ind_code det_occ_code education wage_per_hour hs_college marital_stat "
    "major_ind_code major_occ_code race hisp_origin sex union_member unemp_reason full_or_part_emp "
    "capital_gains capital_losses stock_dividends tax_filer_stat region_prev_res state_prev_res "
    "det_hh_fam_stat det_hh_summ instance_weight mig_chg_msa mig_chg_reg mig_move_reg mig_same "
    "mig_prev_sunbelt num_emp fam_under_18 country_father country_mother country_self citizenship "
    "own_or_self vet_question vet_benefits weeks_worked year income_50k"
).split()
NUMERIC = [0, 5, 16, 17, 18, 24, 30, 36, 38, 39, 40]
MARITAL, INCOME = 7, 41
CATEGORICAL = [i for i in range(len(NAMES)) if i not in NUMERIC and i not in (MARITAL, INCOME)]


def lines():
    raw = sys.stdin.buffer
    if raw.peek(2)[:2] == b"\x1f\x8b":
        raw = gzip.GzipFile(fileobj=raw)
    return io.TextIOWrapper(raw, encoding="latin-1")


def main():
    out = sys.stdout
    for number, line in enumerate(lines(), 1):
        fields = [f.strip() for f in line.rstrip("\n").split(",")]
        if fields == [""]:
            continue
        if len(fields) != len(NAMES):
            sys.exit(f"census.py: line {number} has {len(fields)} fields, expected {len(NAMES)}")
        tokens = [
            "income:%d" % (fields[INCOME] == "50000+."),
            "marital:%d" % (fields[MARITAL] == "Never married"),
        ]
        tokens += ["num:" + fields[i] for i in NUMERIC]
        tokens += ["%s:%d" % (NAMES[i], zlib.crc32(fields[i].encode())) for i in CATEGORICAL]
        out.write(" ".join(tokens) + "\n")


if __name__ == "__main__":
    main()
