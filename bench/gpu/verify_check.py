"""Small helpers for bench/gpu/verify.sh: read memfit's metrics and JSON outputs and compare figures.

Standard library only (any python3 works; nothing is imported from torch or JAX):

    verify_check.py steps METRICS.jsonl          -> "first_loss first_grad_norm last_loss steps all_finite"
    verify_check.py field FILE.json KEY [KEY...] -> the value at that path of the (last) JSON object in FILE
    verify_check.py close A B RTOL               -> prints the relative difference |A-B|/max(|A|,|B|); exit 1 above RTOL
    verify_check.py flat FIRST LAST RTOL SLACK   -> exit 1 if LAST > FIRST * (1 + RTOL) + SLACK
    verify_check.py relabel IN.idx.gz OUT.idx.gz SHIFT -> an IDX label file with SHIFT subtracted from every label
"""
import gzip
import json
import math
import sys


def objects(path):
    """Every JSON object of a file that holds one or several (concatenated or one per line)."""
    text = open(path).read()
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        obj, i = dec.raw_decode(text, i)
        out.append(obj)


def steps(path):
    rows = objects(path)
    if not rows:
        print("nan nan nan 0 false")
        return 1
    losses = [r.get("loss", float("nan")) for r in rows]
    norms = [r.get("grad_norm", float("nan")) for r in rows]
    finite = all(isinstance(v, (int, float)) and math.isfinite(v) for v in losses + norms)
    print(f"{losses[0]!r} {norms[0]!r} {losses[-1]!r} {len(rows)} {str(finite).lower()}")
    return 0


def field(path, keys):
    rows = objects(path)
    if not rows:
        return 1
    v = rows[-1]
    for k in keys:
        if not isinstance(v, dict) or k not in v:
            return 1
        v = v[k]
    print(v)
    return 0


def close(a, b, rtol):
    a, b, rtol = float(a), float(b), float(rtol)
    if not (math.isfinite(a) and math.isfinite(b)):
        print("nan")
        return 1
    scale = max(abs(a), abs(b))
    rel = 0.0 if scale == 0 else abs(a - b) / scale
    print(f"{rel:.2e}")
    return 0 if rel <= rtol else 1


def flat(first, last, rtol, slack):
    return 0 if float(last) <= float(first) * (1 + float(rtol)) + float(slack) else 1


def relabel(src, dst, shift):
    data = gzip.open(src).read()
    if data[:4] != b"\x00\x00\x08\x01":
        raise SystemExit(f"{src}: not an IDX file of unsigned bytes, one dimension")
    labels = bytes(b - int(shift) for b in data[8:])
    with gzip.open(dst, "wb") as f:
        f.write(data[:8] + labels)
    return 0


def main(argv):
    cmd, args = argv[1], argv[2:]
    if cmd == "steps":
        return steps(args[0])
    if cmd == "field":
        return field(args[0], args[1:])
    if cmd == "close":
        return close(*args)
    if cmd == "flat":
        return flat(*args)
    if cmd == "relabel":
        return relabel(*args)
    raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
