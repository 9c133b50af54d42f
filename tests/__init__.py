"""Tests: a package, so that no test folder can shadow an installed distribution of the same name."""
