#!/usr/bin/env python3
"""Keeps the shared cargo target directory from filling the disk.

Cargo never deletes what it built. Every edit of a workspace crate leaves another copy of
its library and of every test binary that links it (a few hundred MB each), and the
incremental cache grows with every build: on the 2-core CI machine, where CI and
development share ~/.cache/herald/target, that is tens of GB a day. This removes, for the
workspace's own crates and test binaries only, every build but the newest three of each
(dependencies are left alone: rebuilding them takes minutes), and the incremental cache
when it is larger than a limit. Usage: prune-target.py TARGET_DIR [MAX_INCREMENTAL_GB]
"""

import collections
import os
import re
import shutil
import sys

KEEP = 3


def workspace_names(repo):
    """Crate and test target names of the workspace, as cargo spells them in deps/."""
    names = set()
    for root, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if d not in ("target", ".git", "fuzz", "node_modules")]
        if "Cargo.toml" in files:
            text = open(os.path.join(root, "Cargo.toml"), encoding="utf-8").read()
            for match in re.finditer(r'^name\s*=\s*"([^"]+)"', text, re.M):
                names.add(match.group(1).replace("-", "_"))
        if os.path.basename(root) in ("tests", "bin", "benches"):
            for f in files:
                if f.endswith(".rs"):
                    names.add(f[:-3].replace("-", "_"))
    return names


def prune(target, max_incremental_gb):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = workspace_names(repo)
    freed = 0
    for profile in ("debug", "release"):
        deps = os.path.join(target, profile, "deps")
        if not os.path.isdir(deps):
            continue
        groups = collections.defaultdict(lambda: collections.defaultdict(list))
        for f in os.listdir(deps):
            m = re.match(r"^(?:lib)?([A-Za-z0-9_]+)-([0-9a-f]{16})(?:\..*)?$", f)
            if m and m.group(1) in names:
                groups[m.group(1)][m.group(2)].append(os.path.join(deps, f))
        for builds in groups.values():
            newest = sorted(builds, key=lambda h: max(os.path.getmtime(p) for p in builds[h]), reverse=True)
            for h in newest[KEEP:]:
                for path in builds[h]:
                    freed += os.path.getsize(path)
                    os.remove(path)
        incremental = os.path.join(target, profile, "incremental")
        if os.path.isdir(incremental):
            size = sum(
                os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(incremental) for f in fs
            )
            if size > max_incremental_gb * 1e9:
                shutil.rmtree(incremental)
                freed += size
    print(f"prune-target: freed {freed / 1e9:.1f} GB in {target}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    prune(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 8.0)
