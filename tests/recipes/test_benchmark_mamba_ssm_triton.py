"""The mamba_ssm baseline's folder: the files the SSD benchmark imports come out of a source archive, with empty
package ``__init__`` files so that nothing compiled is imported; a wrong or incomplete archive is refused by name.
The archive here is made in the test (nothing is downloaded)."""

import hashlib
import io
import subprocess
import sys
import tarfile

import pytest

from recipes.benchmarks import mamba_ssm_triton as tool


def archive_of(files: dict[str, str], outside: dict[str, str] | None = None) -> bytes:
    """The package's ``files`` under ``mamba_ssm-VERSION/mamba_ssm/``, then ``outside`` under ``mamba_ssm-VERSION/``."""
    buffer = io.BytesIO()
    names = {f"mamba_ssm/{name}": text for name, text in files.items()} | (outside or {})
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in names.items():
            data = text.encode()
            info = tarfile.TarInfo(f"mamba_ssm-{tool.VERSION}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def full_archive() -> dict[str, str]:
    files = {name: f"WHO = {name!r}\n" for name in tool.FILES}
    # the real package's __init__ files import compiled extensions: they must not be copied
    files["__init__.py"] = "import selective_scan_cuda\n"
    files["ops/triton/__init__.py"] = "raise ImportError('the archive init ran')\n"
    files["ops/triton/ssd_combined.py"] = ("from mamba_ssm.utils.torch import WHO as TORCH_UTILS\n"
                                          "WHO = 'ops/triton/ssd_combined.py'\n")
    files["ops/selective_scan_interface.py"] = "import selective_scan_cuda\n"  # not needed, not copied
    return files


def test_extract_copies_the_triton_files_and_leaves_the_cuda_imports_behind(tmp_path):
    archive = archive_of(full_archive())
    written = tool.extract(archive, tmp_path, sha256=hashlib.sha256(archive).hexdigest())
    assert len(written) == len(tool.FILES) + len(tool.PACKAGES)
    package = tmp_path / "mamba_ssm"
    assert (package / "ops/triton/ssd_bmm.py").read_text() == "WHO = 'ops/triton/ssd_bmm.py'\n"
    assert all((package / p / "__init__.py").read_text() == "" for p in tool.PACKAGES)
    assert not (package / "ops/selective_scan_interface.py").exists()
    probe = "import mamba_ssm.ops.triton.ssd_combined as m; print(m.WHO, m.TORCH_UTILS)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ops/triton/ssd_combined.py", "utils/torch.py"]


def test_an_archive_that_is_not_the_pinned_one_is_refused(tmp_path):
    archive = archive_of(full_archive())
    with pytest.raises(SystemExit, match="SHA-256 is .* not the pinned"):
        tool.extract(archive, tmp_path)  # the real pin, a made-up archive
    assert not (tmp_path / "mamba_ssm").exists()


def test_an_archive_without_a_needed_file_names_it(tmp_path):
    files = full_archive()
    del files["ops/triton/softplus.py"]
    archive = archive_of(files)
    with pytest.raises(SystemExit, match="lacks ops/triton/softplus.py"):
        tool.extract(archive, tmp_path, sha256=hashlib.sha256(archive).hexdigest())


def test_archive_url_is_read_off_a_simple_index_page():
    page = ('<a href="https://files.example/af/mamba_ssm-2.3.1.tar.gz#sha256=aa">mamba_ssm-2.3.1.tar.gz</a>\n'
            f'<a href="https://files.example/b0/mamba_ssm-{tool.VERSION}.tar.gz#sha256=bb" '
            f'data-requires-python="&gt;=3.9">mamba_ssm-{tool.VERSION}.tar.gz</a>\n')
    assert tool.archive_url(page) == f"https://files.example/b0/mamba_ssm-{tool.VERSION}.tar.gz"
    with pytest.raises(SystemExit, match="names no mamba_ssm-9.9.tar.gz"):
        tool.archive_url(page, version="9.9")


def test_a_missing_archive_file_is_named(tmp_path):
    with pytest.raises(SystemExit, match="--archive .*nope.tar.gz: no such file"):
        tool.main(["--archive", str(tmp_path / "nope.tar.gz"), "--out", str(tmp_path / "out")])


def test_a_file_of_the_same_name_outside_the_package_is_not_taken(tmp_path):
    archive = archive_of(full_archive(), outside={"csrc/ops/triton/ssd_bmm.py": "WHO = 'a copy outside the package'\n"})
    tool.extract(archive, tmp_path, sha256=hashlib.sha256(archive).hexdigest())
    assert (tmp_path / "mamba_ssm/ops/triton/ssd_bmm.py").read_text() == "WHO = 'ops/triton/ssd_bmm.py'\n"
