import pytest

from recipes.cli import main


@pytest.fixture(scope="module")
def trained(request, tmp_path_factory):
    """A real checkpoint written by ``python -m recipes fit`` with the test module's own ``TINY`` flags (a model of
    one block, two steps): its ``last.ckpt``."""
    cwd = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        main(["fit", *request.module.TINY])
    [last] = cwd.glob("runs/**/checkpoints/last.ckpt")
    return last
