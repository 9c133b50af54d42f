"""The model fixtures (a small random Llama) serve the in-process deployment's decoding tests too."""

from tests.model.conftest import small_model  # noqa: F401
