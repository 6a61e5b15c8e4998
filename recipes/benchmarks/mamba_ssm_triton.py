"""mamba_ssm's Triton SSD, alone, as a folder to put first on ``PYTHONPATH``: the baseline row of the SSD benchmarks
(``recipes.benchmarks.ops --ops ssd``, ``ssd_tiles``) on a GPU machine that cannot install the package.

    python -m recipes.benchmarks.mamba_ssm_triton                      # fetch the pinned archive, write .gpu_extra/
    python -m recipes.benchmarks.mamba_ssm_triton --archive mamba_ssm-2.3.2.post1.tar.gz --out /tmp/extra
    PYTHONPATH=$PWD/.gpu_extra:$PWD python -m recipes.benchmarks.ops --ops ssd --lengths 4096 16384

PyPI has mamba_ssm only as a source archive, and its package ``__init__`` imports compiled CUDA extensions, so
``pip install`` needs a CUDA toolchain and ``import mamba_ssm`` fails without one. ``mamba_chunk_scan_combined`` is
Triton alone: this copies the files it imports (``ops/triton/ssd_*``, ``layernorm_gated``, ``k_activations``,
``softplus``, ``utils/determinism``, ``utils/torch``) out of the archive, with empty ``__init__.py`` files in their
packages so that importing them runs none of the CUDA imports. The archive is fetched from the package index pip uses
(its simple page) and must match the pinned SHA-256; run this where the index is reachable, then carry the folder to
the GPU machine. Nothing of mamba_ssm becomes part of this project: the folder is ignored by git.
"""

import argparse
import hashlib
import io
import re
import tarfile
import urllib.request
from pathlib import Path

VERSION = "2.3.2.post1"
SHA256 = "104cc47e9101e5401a675fa2b784f2952b9b037f3b1dd83b5ac544394e95d028"
INDEX = "https://pypi.org/simple/mamba-ssm/"
# what mamba_chunk_scan_combined imports, as paths inside the package
FILES = ("ops/triton/ssd_bmm.py", "ops/triton/ssd_chunk_scan.py", "ops/triton/ssd_chunk_state.py",
         "ops/triton/ssd_combined.py", "ops/triton/ssd_state_passing.py", "ops/triton/layernorm_gated.py",
         "ops/triton/k_activations.py", "ops/triton/softplus.py", "utils/determinism.py", "utils/torch.py")
PACKAGES = ("", "ops", "ops/triton", "utils")  # each gets an empty __init__.py
# what a benchmark prints where its mamba_ssm row cannot run
MAMBA_MISSING = ("mamba_ssm not importable: its row is skipped (`python -m recipes.benchmarks.mamba_ssm_triton` writes "
                 "its Triton SSD to .gpu_extra/; put that first on PYTHONPATH)")


def archive_url(index_html: str, version: str = VERSION) -> str:
    """The source archive's address on a PEP 503 simple page (its ``#sha256=`` fragment dropped)."""
    name = re.escape(f"mamba_ssm-{version}.tar.gz")
    found = re.search(rf'href="([^"#]*{name})(#[^"]*)?"', index_html)
    if found is None:
        raise SystemExit(f"the index page names no mamba_ssm-{version}.tar.gz: pass --archive with a downloaded copy")
    return found.group(1).replace("&amp;", "&")


def fetch_archive(index: str = INDEX) -> bytes:
    with urllib.request.urlopen(index, timeout=60) as page:
        url = archive_url(page.read().decode())
    with urllib.request.urlopen(url, timeout=120) as response:
        return response.read()


def extract(archive: bytes, out: Path, sha256: str = SHA256) -> list[Path]:
    """Write ``FILES`` from the archive's ``mamba_ssm/`` under ``out/mamba_ssm/``, with empty ``__init__.py`` files;
    returns the paths written. An archive whose SHA-256 differs from ``sha256``, or that lacks a file, is refused."""
    digest = hashlib.sha256(archive).hexdigest()
    if digest != sha256:
        raise SystemExit(f"the archive's SHA-256 is {digest}, not the pinned {sha256}: not mamba_ssm {VERSION}")
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        members = {}
        for member in tar.getmembers():  # <top folder>/mamba_ssm/<path>
            parts = member.name.split("/")
            if len(parts) > 2 and parts[1] == "mamba_ssm" and member.isfile():
                members["/".join(parts[2:])] = member
        missing = [f for f in FILES if f not in members]
        if missing:
            raise SystemExit(f"the archive lacks {', '.join(missing)}")
        written = []
        for package in PACKAGES:
            init = out / "mamba_ssm" / package / "__init__.py"
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text("")  # the archive's own __init__ files import the CUDA extensions
            written.append(init)
        for name in FILES:
            target = out / "mamba_ssm" / name
            target.write_bytes(tar.extractfile(members[name]).read())
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m recipes.benchmarks.mamba_ssm_triton",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archive", type=Path,
                        help=f"mamba_ssm-{VERSION}.tar.gz already downloaded (default: fetch it)")
    parser.add_argument("--out", type=Path, default=Path(".gpu_extra"), help="the folder to write (default .gpu_extra)")
    args = parser.parse_args(argv)
    if args.archive is not None and not args.archive.is_file():
        raise SystemExit(f"--archive {args.archive}: no such file")
    archive = args.archive.read_bytes() if args.archive is not None else fetch_archive()
    written = extract(archive, args.out)
    print(f"mamba_ssm {VERSION}'s Triton SSD: {len(written)} files under {args.out / 'mamba_ssm'}; put "
          f"{args.out.resolve()} first on PYTHONPATH (and carry it to the GPU machine)")


if __name__ == "__main__":
    main()
