#!/usr/bin/env python3
"""Exact test AUCs of an `oar predict` score file (oar's log prints 4 decimals).

    pred_auc.py din TEST_DIR SCORES        # labels: the 5th ';' field of TEST_DIR/part-* (sorted)
    pred_auc.py census TEST_FILE SCORES    # labels: income (`50000+.`) and marital (`Never married`)

Prints the AUC of each score column (one per head, in the job file's head order), space-separated.
"""
import glob
import os
import sys

from sklearn.metrics import roc_auc_score


def main():
    kind, test, scores = sys.argv[1:4]
    if kind == "din":
        labels = []
        for f in sorted(glob.glob(os.path.join(test, "part-*"))):
            with open(f) as fh:
                labels += [[float(line.rstrip("\n").split(";")[4])] for line in fh if line.strip()]
    else:
        labels = []
        with open(test, encoding="latin-1") as fh:
            for line in fh:
                f = [x.strip() for x in line.rstrip("\n").split(",")]
                if f == [""]:
                    continue
                labels.append([float(f[41] == "50000+."), float(f[7] == "Never married")])
    with open(scores) as fh:
        preds = [[float(v) for v in line.split("\t")] for line in fh if line.strip()]
    if len(preds) != len(labels):
        sys.exit(f"pred_auc.py: {len(preds)} scores for {len(labels)} lines")
    heads = len(preds[0])
    print(" ".join(f"{roc_auc_score([l[h] for l in labels], [p[h] for p in preds]):.6f}" for h in range(heads)))


if __name__ == "__main__":
    main()
