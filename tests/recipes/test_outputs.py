"""A command never writes over a result silently: the files it would replace are named, with what would be lost."""

import pytest

from recipes.outputs import refuse_overwrite


def test_the_files_that_exist_are_named_in_one_sentence(tmp_path):
    a, b, c, missing = (tmp_path / n for n in ("a.ckpt", "b.json", "c.yaml", "d.txt"))
    refuse_overwrite([missing])  # nothing there: nothing to refuse
    a.write_text("")
    with pytest.raises(FileExistsError) as one:
        refuse_overwrite([missing, a], lost="a trained checkpoint")
    assert str(one.value) == f"{a} already exists: choose another --out, or --force to replace it (a trained checkpoint)"
    b.write_text(""), c.write_text("")
    with pytest.raises(FileExistsError) as two:
        refuse_overwrite([a, missing, b])
    assert str(two.value) == f"{a} and {b} already exist: choose another --out, or --force to replace them"
    with pytest.raises(FileExistsError, match=rf"^{a}, {b} and {c} already exist: .* replace them$"):
        refuse_overwrite([a, b, c])
