"""The package builds, installs and says what it is, before its code lands."""

from importlib.metadata import version

import titan_float8


def test_installed_version_is_the_package_version():
    assert version("titan-float8") == titan_float8.__version__


def test_public_module_documents_its_purpose():
    assert titan_float8.__doc__ and len(titan_float8.__doc__.strip()) > 20
