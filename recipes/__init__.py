"""hybrid-zoo recipes: the LightningModule, data modules, bundled YAML configs and the CLI.

``LanguageModel`` is imported on first use, not with the package: ``python -m recipes`` then starts by importing
nothing heavy, and can answer a Ctrl+C during torch's and Lightning's imports with one line (``recipes.__main__``)."""

__all__ = ["LanguageModel"]


def __getattr__(name: str):
    if name == "LanguageModel":
        from recipes.module import LanguageModel

        return LanguageModel
    raise AttributeError(f"module 'recipes' has no attribute {name!r}")
