"""The package's top level: every reference it exports is there, loaded on first use, and
the course's commands (grading, its Dask workers, the report) start without PyTorch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import attention_ref


@pytest.mark.parametrize("name", attention_ref.__all__)
def test_each_exported_name_is_the_object_its_module_defines(name):
    module = importlib.import_module(f"attention_ref.{attention_ref._MODULE_OF[name]}")
    assert getattr(attention_ref, name) is getattr(module, name)


def test_everything_exported_is_listed_once_and_star_import_gets_it():
    listed = [name for names in attention_ref._EXPORTS.values() for name in names]
    assert len(listed) == len(set(listed)), "a name exported from two modules"
    namespace: dict = {}
    exec("from attention_ref import *", namespace)
    assert set(attention_ref.__all__) <= set(namespace)
    assert set(attention_ref.__all__) <= set(dir(attention_ref))


def test_a_submodule_is_reached_as_an_attribute_and_a_missing_name_is_an_attribute_error():
    assert attention_ref.masking.causal_mask is attention_ref.causal_mask
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        attention_ref.no_such_thing  # noqa: B018


def test_the_course_commands_import_no_pytorch():
    """`make grade` and every process it starts but the kernels and the trusted checker
    (Dask's workers, nbgrader's) import attention_ref.course: PyTorch cost each a second of
    CPU, many times per class."""
    code = (
        "import sys\n"
        "import attention_ref.course.__main__, attention_ref.course.grading\n"
        "import attention_ref.course.cluster, attention_ref.course.report\n"
        "import attention_ref.course.exchange, attention_ref.course.similarity\n"
        "import attention_ref.course.trusted, attention_ref.course.cell_limits\n"
        "import attention_ref.course.sandbox, attention_ref.course.feedback\n"
        "import attention_ref.course.inert\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False", out
