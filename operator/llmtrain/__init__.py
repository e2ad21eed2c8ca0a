"""llmtrain: the LLMTrainingJob API, its renderer, the Kopf operator and the CLI."""

from llmtrain.constants import VERSION

__version__ = VERSION
