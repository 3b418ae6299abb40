#!/usr/bin/env python3
"""Where a cold start's time went: the compilations and autotunes a CubeCL environment records.

    python3 scripts/kernel-records.py target/environment/cubecl-default.db [MORE.db ...]

CubeCL 0.11 records, by default, every kernel compiled or loaded (type, outcome, time from its
definition to its module loaded on the device) and every autotune (candidates that ran, each
one's compile-and-benchmark time, the tune's wall time) in the environment's database, which
Burn's `persistence` feature keeps in `target/environment`. This prints, per process (a CubeCL
session): how many kernels were compiled and what that took, the kernel types that took the
most, and the tunes. Compilations inside a tune count in both. Plain Python, no packages: the
database is SQLite, its records CBOR.
"""
import re
import sqlite3
import struct
import sys
from collections import defaultdict


def cbor(data, i=0):
    """Decodes the CBOR item at `data[i]`: (value, index after it). What serde's ciborium writes."""
    head = data[i]
    major, info = head >> 5, head & 31
    i += 1
    if major == 7:
        if info == 20:
            return False, i
        if info == 21:
            return True, i
        if info in (22, 23):
            return None, i
        if info == 25:
            return _half(data[i:i + 2]), i + 2
        if info == 26:
            return struct.unpack(">f", data[i:i + 4])[0], i + 4
        if info == 27:
            return struct.unpack(">d", data[i:i + 8])[0], i + 8
        raise ValueError(f"simple value {info}")
    if info < 24:
        arg = info
    elif info == 31:
        arg = None
    else:
        size = 1 << (info - 24)
        arg = int.from_bytes(data[i:i + size], "big")
        i += size
    if major == 0:
        return arg, i
    if major == 1:
        return -1 - arg, i
    if major in (2, 3):
        if arg is None:
            raise ValueError("indefinite-length string")
        raw = bytes(data[i:i + arg])
        return (raw if major == 2 else raw.decode("utf-8", "replace")), i + arg
    if major == 4:
        items = []
        for _ in range(arg):
            item, i = cbor(data, i)
            items.append(item)
        return items, i
    if major == 5:
        entries = {}
        for _ in range(arg):
            key, i = cbor(data, i)
            value, i = cbor(data, i)
            entries[key if not isinstance(key, list) else tuple(key)] = value
        return entries, i
    if major == 6:
        return cbor(data, i)
    raise ValueError(f"major type {major}")


def _half(raw):
    bits = int.from_bytes(raw, "big")
    return struct.unpack(">e", bits.to_bytes(2, "big"))[0]


def short(kernel):
    """A kernel's type without its module paths, cut at 150 characters."""
    name = re.sub(r"[A-Za-z_0-9]+::", "", kernel)
    name = re.sub(r"Dynamic(Scalar|Size)<__\w+>, ", "", name)
    return name if len(name) <= 150 else name[:147] + "..."


def seconds(duration):
    """A serde `Duration`: `{secs, nanos}`."""
    return duration["secs"] + duration["nanos"] / 1e9


def records(connection, kind):
    rows = connection.execute(
        "SELECT value FROM entries WHERE namespace = ?", (f"records/v1/{kind}",))
    for (value,) in rows:
        try:
            yield cbor(value)[0]
        except (ValueError, IndexError) as error:
            print(f"  (a {kind} record that does not decode: {error})")


def summarize(path):
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    sessions = {s["id"]: s for s in records(connection, "sessions")}
    compiled = defaultdict(list)
    tunes = defaultdict(list)
    for record in records(connection, "compilation"):
        compiled[record["stamp"]["session"]].append(record)
    for record in records(connection, "autotune"):
        tunes[record["stamp"]["session"]].append(record)
    print(f"{path}: {len(sessions)} sessions")
    for session in sorted(set(compiled) | set(tunes)):
        label = sessions.get(session, {}).get("label")
        marks = compiled[session] + tunes[session]
        end = max(seconds(r["stamp"]["offset"]) for r in marks)
        print(f"\nsession {session} ({label or 'no label'}): last record {end:.1f} s after its start")
        by_outcome = defaultdict(lambda: [0, 0.0])
        by_kernel = defaultdict(lambda: [0, 0.0, 0.0])  # count, seconds, slowest
        for r in compiled[session]:
            outcome = r["record"]["outcome"]
            took = seconds(r["record"]["duration"])
            by_outcome[outcome][0] += 1
            by_outcome[outcome][1] += took
            if outcome == "Compiled":
                kernel = by_kernel[r["record"]["kernel"]]
                kernel[0] += 1
                kernel[1] += took
                kernel[2] = max(kernel[2], took)
        for outcome, (count, took) in sorted(by_outcome.items()):
            print(f"  {outcome}: {count} kernels, {took:.2f} s in all")
        if by_kernel:
            print("  compiled, by kernel type (count, seconds, slowest):")
            ranked = sorted(by_kernel.items(), key=lambda kv: -kv[1][1])
            for kernel, (count, took, slowest) in ranked[:12]:
                print(f"    {count:4d} {took:8.2f} s  {slowest:6.2f} s  {short(kernel)}")
        if tunes[session]:
            walls = [seconds(r["record"]["wall"]) for r in tunes[session]]
            trials = sum(len(r["record"]["trials"]) for r in tunes[session])
            print(f"  autotune: {len(walls)} keys tuned, {trials} candidates run, "
                  f"{sum(walls):.2f} s of wall time in all")
            ranked = sorted(tunes[session], key=lambda r: -seconds(r["record"]["wall"]))
            for r in ranked[:8]:
                record = r["record"]
                print(f"    {seconds(record['wall']):7.2f} s  {len(record['trials'])} candidates  "
                      f"{record['table']}  (slowest trial "
                      f"{max((seconds(t['wall']) for t in record['trials']), default=0):.2f} s)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for database in sys.argv[1:]:
        summarize(database)
