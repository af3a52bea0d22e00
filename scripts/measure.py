#!/usr/bin/env python3
"""The house's figures (issue 28): production lines, the largest file and function, public items,
integration-test binaries and, where the `duplicates` tool is on PATH, repeated-code pairs.

    python3 scripts/measure.py

Production lines are the non-blank, non-comment lines of agent/src outside its `#[cfg(test)]`
items, `_tests.rs` and `tests.rs` files and the files of `#[cfg(test)] mod x;` left out: what the
agent that ships compiles. (`#[cfg(any(test, feature = "bench"))]`, the benchmarks' replays and the
test hooks only the suites call, is never in it: agent/Cargo.toml's `bench` feature, on only in
test and benchmark builds.) Functions are measured as tests/layout.rs measures them.
"""
import pathlib
import re
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "agent" / "src"


# What the shipped agent never compiles: test code, and the benchmarks' replays.
NOT_SHIPPED = ("#[cfg(test)]", '#[cfg(any(test, feature = "bench"))]')

STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'')


def production(text):
    """The file without its `#[cfg(test)]` items: a `mod tests { .. }`, a `mod testing;`, a
    test-only `use` or helper, wherever they sit (NB: cutting at the first one dropped the
    production code after a test-only item near a file's top from the count)."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if not lines[i].lstrip().startswith(NOT_SHIPPED):
            out.append(lines[i])
            i += 1
            continue
        if lines[i].rstrip().endswith(";"):  # `#[cfg(test)] mod x;` on one line
            i += 1
            continue
        i += 1
        while i < len(lines) and lines[i].lstrip().startswith("#["):
            i += 1
        depth = 0
        while i < len(lines):
            code = STRINGS.sub("", lines[i]).split("//")[0]
            depth += code.count("{") - code.count("}")
            i += 1
            if depth <= 0 and ("{" in code or code.rstrip().endswith((";", "}"))):
                break
    return out


def fn_lengths(lines):
    out, i = [], 0
    sig_re = re.compile(r"^(?:pub(?:\([a-z]+\))? )?(?:const )?(?:async )?(?:unsafe )?fn (\w+)")
    while i < len(lines):
        code = lines[i].lstrip()
        indent = lines[i][: len(lines[i]) - len(code)]
        m = sig_re.match(code)
        if not m:
            i += 1
            continue
        j, body = i, False
        while j < len(lines):
            line = lines[j].rstrip()
            body |= "{" in line
            if j == i:
                closes = line.endswith("}") or (not body and line.endswith(";"))
            else:
                closes = line == indent + "}" or (not body and line.endswith(";"))
            if closes:
                break
            j += 1
        out.append((m.group(1), j - i + 1))
        i = j + 1
    return out


def test_only_files():
    """The files of modules declared under `#[cfg(test)]` (`mod fuzz;` in lib.rs: test code) or
    the `bench` feature's (the replays)."""
    out = set()
    for path in SRC.rglob("*.rs"):
        lines = path.read_text().splitlines()
        for above, line in zip(lines, lines[1:]):
            m = re.match(r"\s*(?:pub(?:\([a-z]+\))? )?mod (\w+);", line)
            if m and above.strip() in NOT_SHIPPED:
                folder = path.parent if path.name in ("lib.rs", "mod.rs") else path.with_suffix("")
                for f in (folder / f"{m.group(1)}.rs", folder / m.group(1) / "mod.rs"):
                    out.add(f.relative_to(SRC).as_posix())
    return out


def main():
    code_lines, files, fns, pubs = 0, [], [], 0
    tests_only = test_only_files()
    for path in sorted(SRC.rglob("*.rs")):
        rel = path.relative_to(SRC).as_posix()
        text = path.read_text()
        files.append((len(text.splitlines()), rel))
        if rel.endswith("_tests.rs") or rel.endswith("/tests.rs") or rel in tests_only:
            continue
        prod = production(text)
        code_lines += sum(
            1 for l in prod if l.strip() and not l.strip().startswith("//")
        )
        pubs += sum(1 for l in prod if re.match(r"\s*pub ", l))
        if not rel.endswith("demo.rs"):
            fns += [(n, name, rel) for name, n in fn_lengths(prod)]
    tests = ROOT / "tests"
    test_lines = sum(
        1
        for p in tests.rglob("*.rs")
        for l in p.read_text().splitlines()
        if l.strip() and not l.strip().startswith("//")
    )
    binaries = (ROOT / "agent" / "Cargo.toml").read_text().count("[[test]]")
    big_file = max(files)
    big_fn = max(fns)
    print(f"production lines (agent/src, code only): {code_lines}")
    print(f"`pub` items outside tests: {pubs}")
    print(f"source files: {len(files)}; largest: {big_file[1]} ({big_file[0]} lines)")
    print(f"largest function: {big_fn[2]}: {big_fn[1]} ({big_fn[0]} lines)")
    print(f"tests/ lines (code only): {test_lines}")
    print(f"integration-test binaries: {binaries}")
    if shutil.which("duplicates"):
        out = subprocess.run(
            ["duplicates", "--repo", str(ROOT), "--most", "1", "--seconds", "120"],
            capture_output=True,
            text=True,
        ).stdout
        print(f"duplicates: {out.splitlines()[0] if out else '(no answer)'}")


if __name__ == "__main__":
    main()
