#!/usr/bin/env python3
"""The Dockerfiles' CMake configure step, run here: each deploy/Dockerfile.* builds with the
options its `RUN cmake -S . -B /build ...` line gives (tests off, CUDA on or off), a combination
the test build itself never configures. Configures the source tree into a scratch directory with
exactly those -D options and checks that the `tinyserve` target exists; the build itself is the
main build's. (A set_tests_properties outside the tests' guard once broke the images here.)

Usage: test_docker_configure.py --repo SRC --work DIR
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys


def cmake_options(dockerfile):
    """The -D options of the Dockerfile's `cmake -S . -B` command, ARG defaults substituted."""
    text = open(dockerfile).read()
    args = dict(re.findall(r'^ARG (\w+)=(\S*)', text, re.M))
    joined = re.sub(r'\\\n', ' ', text)
    m = re.search(r'cmake -S \. -B \S+(.*?)(&&|$)', joined, re.M)
    if m is None:
        raise SystemExit(f"{dockerfile}: no `cmake -S . -B` line")
    opts = re.findall(r'-D\S+', m.group(1))
    return [re.sub(r'\$\{(\w+)\}', lambda v: args.get(v.group(1), ''), o).replace('"', '')
            for o in opts]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    dockerfiles = sorted(glob.glob(os.path.join(a.repo, "deploy", "Dockerfile.*")))
    if not dockerfiles:
        raise SystemExit("no deploy/Dockerfile.*")
    failed = 0
    for df in dockerfiles:
        opts = cmake_options(df)
        if "-DTINYSERVE_CUDA=ON" in opts and shutil.which("nvcc") is None and \
                not os.path.exists("/usr/local/cuda/bin/nvcc"):
            print(f"{os.path.basename(df)}: needs the CUDA toolkit, not here; skipped")
            continue
        build = os.path.join(a.work, os.path.basename(df).replace("Dockerfile.", ""))
        shutil.rmtree(build, ignore_errors=True)
        cmd = ["cmake", "-S", a.repo, "-B", build, "-G", "Ninja"] + opts
        r = subprocess.run(cmd, capture_output=True, text=True)
        targets = subprocess.run(["cmake", "--build", build, "--target", "help"],
                                 capture_output=True, text=True).stdout if r.returncode == 0 else ""
        ok = r.returncode == 0 and re.search(r'^tinyserve:', targets, re.M) is not None
        print(f"{os.path.basename(df)}: {' '.join(opts)}: {'ok' if ok else 'FAILED'}")
        if not ok:
            failed += 1
            sys.stdout.write(r.stdout[-3000:] + r.stderr[-3000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
