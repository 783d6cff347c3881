"""The package builds, installs and says what it is, before its code lands."""

from importlib.metadata import version

import titan_checkpoint


def test_installed_version_is_the_package_version():
    assert version("titan-checkpoint") == titan_checkpoint.__version__


def test_public_module_documents_its_purpose():
    assert titan_checkpoint.__doc__ and len(titan_checkpoint.__doc__.strip()) > 20
