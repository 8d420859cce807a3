#!/usr/bin/env python3
"""Fails when a C++ function definition in the product sources runs over MAX_LINES lines.

A function's length is counted from the first line of its signature to the line of its closing
brace, lambdas and local classes included (they are part of the function that holds them).

How it finds functions: the sources are clang-formatted (Google style), so a brace-matching scan
is enough once comments, string and character literals (raw strings included) and preprocessor
lines are blanked out. A '{' opened at namespace or class scope starts a function body when the
text before it, back to the previous ';', '{' or '}', looks like a signature: balanced
parentheses ending in ')' plus optional qualifiers, a trailing return type or a constructor's
member-initialiser list. Everything between that '{' and its matching '}' belongs to the function.

Usage: check_function_length.py SOURCE_ROOT     check the tree (exit 1 listing each offender)
       check_function_length.py --self-test     check the checker on made-up sources
"""

import os
import re
import subprocess
import sys
import tempfile

MAX_LINES = 80
SOURCE_DIRS = ("agent", "collector", "lib", "viewer-cli", "interposer")
SUFFIXES = (".cc", ".h", ".cpp", ".hpp", ".cu")


def is_generated(text):
    """A file that says it is generated (first lines) is not written by hand: skip it."""
    head = text[:600]
    return "GENERATED" in head and "do not edit" in head


def blank(text):
    """Returns text with comments, literals and preprocessor lines replaced by spaces.

    Newlines are kept so that line numbers still hold.
    """
    out = []
    i, n = 0, len(text)
    at_line_start = True  # only whitespace so far on this line

    def spaces(s):
        return re.sub(r"[^\n]", " ", s)

    while i < n:
        c = text[i]
        if c == "\n":
            out.append(c)
            i += 1
            at_line_start = True
            continue
        if at_line_start and c == "#":
            # A preprocessor directive, with its backslash-continued lines.
            j = i
            while j < n:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                if k > 0 and text[k - 1] == "\\" and k < n:
                    j = k + 1
                    continue
                break
            out.append(spaces(text[i:k]))
            i = k
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            k = text.find("\n", i)
            k = n if k < 0 else k
            out.append(spaces(text[i:k]))
            i = k
            continue
        if text.startswith("/*", i):
            k = text.find("*/", i + 2)
            k = n if k < 0 else k + 2
            out.append(spaces(text[i:k]))
            i = k
            continue
        if c == '"':
            before = text[max(0, i - 3):i]
            if re.search(r"(?:^|[^A-Za-z0-9_])(?:u8|u|U|L)?R$", "\0" + before):
                m = re.match(r'"([^()\\\s]{0,16})\(', text[i:])
                if m:
                    end = text.find(")" + m.group(1) + '"', i + len(m.group(0)))
                    k = n if end < 0 else end + len(m.group(1)) + 2
                    out.append(spaces(text[i:k]))
                    i = k
                    continue
            k = i + 1
            while k < n and text[k] != '"' and text[k] != "\n":
                k += 2 if text[k] == "\\" else 1
            k = min(k + 1, n)
            out.append(spaces(text[i:k]))
            i = k
            continue
        if c == "'":
            # A digit separator (1'000'000) or a character literal.
            j = i - 1
            while j >= 0 and (text[j].isalnum() or text[j] in "_.'"):
                j -= 1
            if j + 1 < i and text[j + 1].isdigit():
                out.append(c)
                i += 1
                continue
            k = i + 1
            while k < n and text[k] != "'" and text[k] != "\n":
                k += 2 if text[k] == "\\" else 1
            k = min(k + 1, n)
            out.append(spaces(text[i:k]))
            i = k
            continue
        out.append(c)
        i += 1
    return "".join(out)


CONTROL = {"if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignof"}
# Qualifiers after the parameter list; upper-case words are attribute macros such as
# ABSL_NO_THREAD_SAFETY_ANALYSIS or ABSL_LOCKS_EXCLUDED(mu_).
QUALIFIERS = (r"(?:\s*(?:const|volatile|noexcept(?:\s*\([^()]*\))?|override|final|mutable|&&|&"
              r"|[A-Z][A-Z0-9_]*(?:\s*\([^()]*\))?))*")
TRAILING_RETURN = r"(?:\s*->\s*[^{};=]+)?"
ENDS_LIKE_SIGNATURE = re.compile(r"\)" + QUALIFIERS + TRAILING_RETURN + r"\s*$")


def top_level_paren_colon(header):
    """True when the header has ') :' outside parentheses: a constructor's initialiser list."""
    depth = 0
    prev_close = False
    for ch in header:
        if ch == "(":
            depth += 1
            prev_close = False
        elif ch == ")":
            depth -= 1
            prev_close = depth == 0
        elif ch.isspace():
            continue
        elif ch == ":" and depth == 0 and prev_close:
            return True
        else:
            prev_close = False if ch != ":" else prev_close
    return False


def signature_name(header):
    """The identifier before the outermost '(' of the parameter list (for the report)."""
    flat = " ".join(header.split())
    m = re.search(r"\)" + QUALIFIERS + TRAILING_RETURN + r"\s*$", flat)
    if m:
        flat = flat[:m.start() + 1]
    depth = 0
    for idx in range(len(flat) - 1, -1, -1):
        ch = flat[idx]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                m = re.search(r"([~A-Za-z_][\w:~<>]*(?:operator\s*\S+?)?|\])\s*$", flat[:idx])
                if m:
                    name = m.group(1)
                    if not top_level_paren_colon(flat[:idx]):
                        return "lambda" if name == "]" else name
    return flat[:60]


def is_signature(header):
    flat = " ".join(header.split())
    if not flat or flat.count("(") != flat.count(")"):
        return False
    if re.match(r"^(?:namespace|class|struct|union|enum)\b", flat):
        return False
    if top_level_paren_colon(flat):
        return True
    if not ENDS_LIKE_SIGNATURE.search(flat):
        return False
    m = re.search(r"([A-Za-z_]\w*)\s*\(", flat)
    return not (m and m.group(1) in CONTROL and flat.startswith(m.group(1)))


def matching_brace(code, i):
    """The index of the '}' that closes the '{' at code[i] (the last index if none does)."""
    depth = 0
    for k in range(i, len(code)):
        depth += {"{": 1, "}": -1}.get(code[k], 0)
        if depth == 0:
            return k
    return len(code) - 1


def functions(text):
    """Yields (first_line, last_line, name) for each function defined outside other functions."""
    code = blank(text)
    line_of = []
    line = 1
    for ch in code:
        line_of.append(line)
        if ch == "\n":
            line += 1
    # Scopes that are not functions (namespaces, classes, enums, initialisers) are entered and
    # left without bookkeeping: a function body is skipped whole once its signature is seen.
    access = r"^\s*(?:(?:public|private|protected)\s*:(?!:))?\s*"
    header_start = 0
    i, n = 0, len(code)
    while i < n:
        ch = code[i]
        if ch in ";}":
            header_start = i + 1
        elif ch == "{":
            header = code[header_start:i]
            if header.count("(") > header.count(")"):
                # Braces inside a parameter list (a default argument such as '= {}').
                i = matching_brace(code, i) + 1
                continue
            header = re.sub(access, "", header)
            if top_level_paren_colon(header) and re.search(r"[\w>]\s*$", header):
                # A member initialised with braces in a constructor's initialiser list.
                i = matching_brace(code, i) + 1
                continue
            if is_signature(header):
                start = i - len(header)
                k = matching_brace(code, i)
                yield line_of[start], line_of[k], signature_name(header)
                i = k + 1
                header_start = i
                continue
            header_start = i + 1
        i += 1


def source_files(root):
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if d not in ("build", "tests"))
            for name in sorted(filenames):
                if name.endswith(SUFFIXES):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, root)


def check(root, out=sys.stdout):
    """Returns the number of functions over MAX_LINES lines; prints every one."""
    bad = 0
    count = 0
    for rel in source_files(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        if is_generated(text):
            continue
        for first, last, name in functions(text):
            count += 1
            length = last - first + 1
            if length <= MAX_LINES:
                continue
            bad += 1
            print(f"{rel}:{first}: {name} is {length} lines (limit {MAX_LINES})", file=out)
    print(f"{count} functions checked; {bad} over {MAX_LINES} lines", file=out)
    return bad


def self_test():
    """Runs the checker on made-up files; returns 0 when it finds exactly what it should."""
    def body(lines):
        return "".join(f"  x += {k};\n" for k in range(lines))

    tricky = (
        "#include <string>\n"
        "#define OPEN {\n"
        "namespace a {\n"
        "// a comment with a brace {\n"
        "/* and a block { comment */\n"
        "const char* kS = \"{ not a brace \\\" {\";\n"
        "const char* kR = R\"x(raw { \" brace)x\";\n"
        "const char kC = '{';\n"
        "const int kN = 1'000'000;\n"
        "class K {\n"
        " public:\n"
        "  K() : a_{1}, b_(2) {\n" + body(10) + "  }\n"
        "  int Get() const { return a_; }\n"
        " private:\n"
        "  int a_, b_;\n"
        "};\n"
        "int Long(int x) {\n"
        "  auto f = [&](int y) {\n"
        "    if (y) {\n" + body(70) + "    }\n"
        "    return y;\n"
        "  };\n"
        "  return f(x);\n"
        "}\n"  # 1 + 1 + 1 + 70 + 1 + 1 + 1 + 1 + 1 = 78 lines
        "int Over(int x) {\n" + body(MAX_LINES - 1) + "  return x;\n}\n"  # MAX_LINES + 2
        "void Defaults(const std::vector<int>& v = {}) ABSL_LOCKS_EXCLUDED(mu_) {\n"
        + body(3) + "}\n"
        "}  // namespace a\n"
        "extern \"C\" int Exported(int x) {\n" + body(2) + "}\n"
        "namespace a {\n"
        "int AtLimit(int x) {\n" + body(MAX_LINES - 3) + "  return x;\n}\n"  # MAX_LINES
        "}  // namespace a\n")
    found = {name: last - first + 1 for first, last, name in functions(tricky)}
    want = {"K": 12, "Get": 1, "Long": 78, "Over": MAX_LINES + 2, "AtLimit": MAX_LINES,
            "Defaults": 5, "Exported": 4}
    ok = found == want
    print(f"made-up functions: found {found}, want {want}: {'ok' if ok else 'WRONG'}")

    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "lib"))
        with open(os.path.join(root, "lib", "long.cc"), "w") as f:
            f.write(tricky)
        os.makedirs(os.path.join(root, "interposer", "shim"))
        with open(os.path.join(root, "interposer", "shim", "gen.cc"), "w") as f:
            f.write("// GENERATED by a script: do not edit.\n" + tricky)
        with open(os.path.join(root, "lib", "short.cc"), "w") as f:
            f.write("int Short() {\n" + body(5) + "}\n")
        result = subprocess.run([sys.executable, __file__, root], capture_output=True, text=True)
        flagged = "lib/long.cc:" in result.stdout and " Over is " in result.stdout
        only = result.stdout.count("(limit") == 1
        tree_ok = result.returncode == 1 and flagged and only
        print(f"tree with one long function: exit {result.returncode}, output:\n{result.stdout}"
              f"{'ok' if tree_ok else 'WRONG'}")
        os.remove(os.path.join(root, "lib", "long.cc"))
        result = subprocess.run([sys.executable, __file__, root], capture_output=True, text=True)
        clean_ok = result.returncode == 0
        print(f"tree without it: exit {result.returncode}: {'ok' if clean_ok else 'WRONG'}")
    return 0 if ok and tree_ok and clean_ok else 1


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    return 1 if check(argv[1]) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
