"""Property tests: every form of input a drawing or measuring helper takes is checked alike.

The forms: a placed ``jax.Array``, an abstract ``jax.ShapeDtypeStruct`` with a sharding, and
a ``(shape, sharding)`` pair. A spec that does not fit its array (more entries than
dimensions, a dimension its mesh axes do not divide) gets the series' ``ValueError`` naming
the helper and the shape, in every form, never an error from inside jax (IndivisibleError,
IndexError). A spec that fits is drawn and counted the same way in every form.
"""

from __future__ import annotations

import jax
import matplotlib
import matplotlib.pyplot as plt
import pytest
from generators import any_specs, drawing_settings, meshes, shapes, spec_fits
from hypothesis import assume, given
from hypothesis import strategies as st
from jax.sharding import NamedSharding

from helpers import draw_param_shardings, draw_sharding, planned_bytes_per_device
from helpers.placing.sharding import sharding_of

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@st.composite
def shardings_for(draw, shape):
    """A NamedSharding that jax constructs (unknown or repeated axes it refuses itself)."""
    mesh = draw(meshes())
    spec = draw(any_specs(shape, mesh))
    try:
        sharding = NamedSharding(mesh, spec)
    except Exception:  # jax refuses unknown or repeated axes itself (DuplicateSpecError)
        assume(False)
    return mesh, spec, sharding


def _forms(shape, sharding):
    """The abstract and pair forms (jax refuses some specs longer than the rank itself, when
    the ShapeDtypeStruct is made: then only the pair reaches a helper)."""
    try:
        abstract = jax.ShapeDtypeStruct(shape, jax.numpy.float32, sharding=sharding)
    except ValueError:
        return {"pair": (shape, sharding)}
    return {"abstract": abstract, "pair": (shape, sharding)}


_SETTINGS = drawing_settings(max_examples=40)


@_SETTINGS
@given(st.data())
def test_a_spec_that_does_not_fit_gets_the_series_error_in_every_form(data):
    shape = data.draw(shapes(0, 4))
    mesh, spec, sharding = data.draw(shardings_for(shape))
    assume(not spec_fits(shape, spec, mesh))
    for form, x in _forms(shape, sharding).items():
        with pytest.raises(ValueError, match=r"draw_sharding.*shape") as err:
            draw_sharding(x)
        assert "spec" in str(err.value), form
        with pytest.raises(ValueError, match="sharding_of_test"):
            sharding_of(x, "sharding_of_test")
    abstract = _forms(shape, sharding).get("abstract")
    if abstract is None:
        return
    with pytest.raises(ValueError, match=r"planned_bytes_per_device: parameter 'w'"):
        planned_bytes_per_device({"w": abstract})
    with pytest.raises(ValueError, match=r"draw_param_shardings: parameter 'w'"):
        draw_param_shardings({"w": abstract})


@_SETTINGS
@given(st.data())
def test_a_spec_that_fits_is_drawn_alike_in_every_form(data):
    shape = data.draw(shapes(0, 3))
    mesh, spec, sharding = data.draw(shardings_for(shape))
    assume(spec_fits(shape, spec, mesh))
    placed = jax.device_put(jax.numpy.zeros(shape), sharding)
    forms = {**_forms(shape, sharding), "placed": placed}
    drawn = {}
    for form, x in forms.items():
        ax = draw_sharding(x)
        drawn[form] = sorted(
            p.get_gid() for p in ax.patches if (p.get_gid() or "").startswith("block:")
        )
        plt.close(ax.figure)
    assert drawn["abstract"] == drawn["pair"] == drawn["placed"]
    assert planned_bytes_per_device({"w": forms["abstract"]}) == planned_bytes_per_device(
        {"w": placed}
    )


@given(st.one_of(st.just((2, -1)), st.just((2.5,)), st.just("ab"), st.just((True, 2))))
def test_a_pair_with_a_bad_shape_is_refused_naming_it(shape):
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    with pytest.raises(ValueError, match="shape of a \\(shape, sharding\\) pair"):
        draw_sharding((shape, NamedSharding(mesh, jax.sharding.PartitionSpec())))
