"""The model fixtures (a small random Llama) serve the engine's decoding tests too."""

from tests.model.conftest import small_model  # noqa: F401
