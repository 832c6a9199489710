#!/usr/bin/env python3
"""Checks the Dockerfile against what this repository builds.

hadolint (run by scripts/check-image.sh) checks general Dockerfile practice;
this checks what it cannot know about accel:
  - multi-stage, every base image pinned by tag or digest (never `latest`,
    never untagged), the Rust image at the toolchain of rust-toolchain.toml;
  - the final stage is on a small base (scratch, distroless or -slim) and
    runs as a numeric non-root user (UID and GID), its
    ENTRYPOINT is in exec (JSON) form and names an installed binary;
  - `cargo build` names workspace packages that build without libtorch
    (the default-members), with --release and --locked, and every binary
    target of those packages is installed, none that does not exist;
  - the OCI version and license labels match Cargo.toml, EXPOSE has the
    rendezvous port, the Kubernetes manifests name the image at this version;
  - a .dockerignore keeps target/ and .git out of the build context.

Usage: scripts/check_dockerfile.py [DOCKERFILE]   (default: Dockerfile)
       scripts/check_dockerfile.py --compare-image-config INSPECT.json [DOCKERFILE]
         also: a built image's OCI config (User, ports, entrypoint, labels;
         from `buildah inspect --type image`)
         is the one the Dockerfile's final stage declares.
Exits 1 with one line per problem.
"""

import json
import re
import shlex
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RDZV_PORT = "29400"


def instructions(text):
    """(line number, INSTRUCTION, arguments) with continuations joined."""
    out, buf, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue  # comment lines inside a continued instruction
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((start, word.upper(), rest.strip()))
        buf = ""
    if buf:
        word, _, rest = buf.strip().partition(" ")
        out.append((start, word.upper(), rest.strip()))
    return out


def substitute(value, args):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), value)


def packages():
    """Workspace package names: {name: (member dir, [bin names])}, and the default members."""
    ws = tomllib.loads((ROOT / "Cargo.toml").read_text())
    found = {}
    for member in ws["workspace"]["members"]:
        manifest = tomllib.loads((ROOT / member / "Cargo.toml").read_text())
        name = manifest["package"]["name"]
        bins = [b["name"] for b in manifest.get("bin", [])]
        if not bins and (ROOT / member / "src" / "main.rs").exists():
            bins = [name]
        found[name] = (member, bins)
    defaults = set(ws["workspace"].get("default-members", ws["workspace"]["members"]))
    return ws, found, defaults


def check(path, final_config=None):
    """Problems found in the Dockerfile at path; fills final_config (a dict) with
    the final stage's USER, EXPOSE, ENTRYPOINT and LABELs."""
    problems = []
    final_config = {} if final_config is None else final_config

    def bad(line, msg):
        problems.append(f"{path.name}:{line}: {msg}")

    text = path.read_text()
    ins = instructions(text)
    ws, pkgs, default_members = packages()
    version = ws["workspace"]["package"]["version"]
    license_ = ws["workspace"]["package"]["license"]
    toolchain = tomllib.loads((ROOT / "rust-toolchain.toml").read_text())["toolchain"]["channel"]

    # ARGs declared before the first FROM (usable in FROM lines).
    global_args, stages = {}, []
    for n, word, rest in ins:
        if word == "FROM":
            stages.append({"line": n, "from": rest, "ins": []})
        elif not stages and word == "ARG":
            k, _, v = rest.partition("=")
            global_args[k.strip()] = v.strip().strip('"')
        elif stages:
            stages[-1]["ins"].append((n, word, rest))
        elif word != "ARG":
            bad(n, f"{word} before the first FROM")
    if len(stages) < 2:
        bad(1, f"not multi-stage: {len(stages)} FROM (a build stage and a small final stage expected)")
    if not stages:
        return problems

    names = set()
    for st in stages:
        parts = st["from"].split()
        image = substitute(parts[0], global_args) if parts else ""
        if len(parts) >= 3 and parts[1].upper() == "AS":
            names.add(parts[2])
        if image == "scratch" or image in names:
            continue
        if "$" in image:
            bad(st["line"], f"base image {parts[0]} uses an ARG without a default")
            continue
        ref = image.split("@")[0]
        tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else None
        if "@sha256:" not in image and not tag:
            bad(st["line"], f"base image {image} is not pinned (no tag or digest)")
        if tag == "latest":
            bad(st["line"], f"base image {image} uses the latest tag")
        if ref.split(":")[0] in ("rust", "docker.io/library/rust") and tag and not tag.startswith(toolchain):
            bad(st["line"], f"base image {image} is not the toolchain of rust-toolchain.toml ({toolchain})")

    final = stages[-1]
    base = substitute(final["from"].split()[0], global_args) if final["from"] else ""
    if base not in names and not (base == "scratch" or "distroless" in base or "-slim" in base):
        bad(final["line"], f"the final stage is FROM {base}: not a small base (scratch, distroless, *-slim)")
    # ARG defaults in scope for the final stage (global ones it redeclares, and its own).
    final_args = {}
    for n, word, rest in final["ins"]:
        if word == "ARG":
            k, _, v = rest.partition("=")
            final_args[k.strip()] = v.strip().strip('"') if v else global_args.get(k.strip(), "")

    users = [(n, rest) for n, word, rest in final["ins"] if word == "USER"]
    if not users:
        bad(final["line"], "the final stage has no USER (it would run as root)")
    else:
        n, user = users[-1]
        uid, _, gid = user.partition(":")
        if not uid.isdigit() or (gid and not gid.isdigit()):
            bad(n, f"USER {user} is not numeric UID:GID (Kubernetes runAsNonRoot needs a numeric UID)")
        elif int(uid) == 0 or (gid and int(gid) == 0):
            bad(n, f"USER {user} is root")
        elif not gid:
            bad(n, f"USER {user} has no numeric group (the group would be root's)")

    installed = set()
    for st in stages:
        for n, word, rest in st["ins"]:
            if word != "RUN" or "cargo build" not in rest:
                continue
            try:
                argv = shlex.split(rest.split("cargo build", 1)[1].split("&&", 1)[0])
            except ValueError as e:
                bad(n, f"cannot parse the cargo build command: {e}")
                continue
            built = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("-p", "--package")]
            for flag in ("--release", "--locked"):
                if flag not in argv:
                    bad(n, f"cargo build without {flag}")
            if not built:
                bad(n, "cargo build names no -p PACKAGE (the whole workspace needs libtorch)")
            for p in built:
                if p not in pkgs:
                    bad(n, f"cargo build -p {p}: no such workspace package ({', '.join(sorted(pkgs))})")
                elif pkgs[p][0] not in default_members:
                    bad(n, f"cargo build -p {p}: not a default member (it needs libtorch or other extras)")
            m = re.search(r"for (\w+) in ([^;]+);", rest)
            copied = m.group(2).split() if m else []
            if not copied:
                bad(n, "no `for b in BIN...;` loop installing the binaries")
            bins_of_built = {b for p in built if p in pkgs for b in pkgs[p][1]}
            for b in copied:
                if b not in bins_of_built:
                    bad(n, f"installs {b}, which none of the built packages has as a binary")
            for b in sorted(bins_of_built - set(copied)):
                bad(n, f"binary {b} is built but not installed")
            installed |= set(copied)
    if not installed:
        bad(1, "no stage runs cargo build")

    entry = [(n, rest) for n, word, rest in final["ins"] if word == "ENTRYPOINT"]
    if not entry:
        bad(final["line"], "the final stage has no ENTRYPOINT")
    else:
        n, rest = entry[-1]
        try:
            argv = json.loads(rest)
            if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError
        except ValueError:
            bad(n, f"ENTRYPOINT {rest} is not in exec form (a JSON array of strings)")
        else:
            prog = argv[0]
            if not prog.startswith("/usr/local/bin/") or prog.rsplit("/", 1)[1] not in installed:
                bad(n, f"ENTRYPOINT {prog} is not one of the installed binaries in /usr/local/bin")

    ports = {p.split("/")[0] for n, word, rest in final["ins"] if word == "EXPOSE" for p in rest.split()}
    if RDZV_PORT not in ports:
        bad(final["line"], f"the final stage does not EXPOSE {RDZV_PORT} (the rendezvous port)")

    labels = {}
    for n, word, rest in final["ins"]:
        if word == "LABEL":
            for item in shlex.split(rest):
                k, _, v = item.partition("=")
                labels[k] = substitute(v, final_args)
    want = {
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": license_,
    }
    for k, v in want.items():
        if labels.get(k) != v:
            bad(final["line"], f"label {k}={labels.get(k)!r}, Cargo.toml says {v!r}")
    if "org.opencontainers.image.source" not in labels:
        bad(final["line"], "no org.opencontainers.image.source label")

    for manifest in sorted((ROOT / "deploy").rglob("*.y*ml")):
        for n, line in enumerate(manifest.read_text().splitlines(), 1):
            for tag in re.findall(r"accel/rdzv-server:([\w.\-]+)", line):
                if tag != version:
                    problems.append(
                        f"{manifest.relative_to(ROOT)}:{n}: image accel/rdzv-server:{tag}, "
                        f"the image is built as accel/rdzv-server:{version}"
                    )

    final_config.update(
        User=users[-1][1] if users else None,
        ExposedPorts=sorted(ports),
        Entrypoint=json.loads(entry[-1][1]) if entry and entry[-1][1].startswith("[") else None,
        Labels=labels,
    )

    ignore = path.parent / ".dockerignore"
    if not ignore.exists():
        bad(1, "no .dockerignore beside it (target/ and .git would be sent as build context)")
    else:
        entries = {e.strip().rstrip("/").lstrip("/") for e in ignore.read_text().splitlines()}
        for need in ("target", ".git"):
            if need not in entries:
                problems.append(f".dockerignore: {need} is not excluded")
    return problems


def compare(want, image_config):
    """Differences between the final stage's configuration and a built image's
    (the OCI config object); source and revision labels are build arguments."""
    got_ports = sorted(p.split("/")[0] for p in (image_config.get("ExposedPorts") or {}))
    got_labels = image_config.get("Labels") or {}
    diffs = []
    for key, got in (("User", image_config.get("User")), ("ExposedPorts", got_ports),
                     ("Entrypoint", image_config.get("Entrypoint"))):
        if got != want[key]:
            diffs.append(f"{key}: image {got!r}, Dockerfile {want[key]!r}")
    for k, v in want["Labels"].items():
        if k not in got_labels:
            diffs.append(f"label {k}: missing in the image")
        elif not k.endswith((".source", ".revision")) and got_labels[k] != v:
            diffs.append(f"label {k}: image {got_labels[k]!r}, Dockerfile {v!r}")
    path = [e for e in image_config.get("Env") or [] if e.startswith("PATH=")]
    if not path or "/usr/local/bin" not in path[0].split("=", 1)[1].split(":"):
        diffs.append(f"Env: no PATH with /usr/local/bin ({path}), as a build from the Dockerfile has")
    if image_config.get("Cmd"):
        diffs.append(f"Cmd: image {image_config['Cmd']!r}, Dockerfile none")
    return diffs


def main():
    args = sys.argv[1:]
    image_config = None
    if args[:1] == ["--compare-image-config"]:
        # --compare-image-config JSON_FILE [DOCKERFILE]: the built image agrees
        # with the Dockerfile's final stage.
        image_config = json.loads(Path(args[1]).read_text())
        # `buildah inspect --type image` output, or the OCI config object itself.
        image_config = image_config.get("OCIv1", {}).get("config", image_config)
        args = args[2:]
    path = Path(args[0] if args else ROOT / "Dockerfile").resolve()
    final_config = {}
    problems = check(path, final_config)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check_dockerfile: {len(problems)} problem(s) in {path}", file=sys.stderr)
        return 1
    if image_config is not None:
        diffs = compare(final_config, image_config)
        for d in diffs:
            print(f"image config differs from {path.name}: {d}", file=sys.stderr)
        if diffs:
            return 1
        print(f"check_dockerfile: the image's configuration matches {path.name}'s final stage")
        return 0
    print(f"check_dockerfile: {path.name} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
