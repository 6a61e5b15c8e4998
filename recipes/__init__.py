"""hybrid-zoo recipes: the LightningModule, data modules, bundled YAML configs and the CLI."""

from recipes.module import LanguageModel

__all__ = ["LanguageModel"]
