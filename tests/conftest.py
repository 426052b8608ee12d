"""Unit tests run on 8 simulated CPU devices, whatever NUM_DEVICES says for the notebooks."""

from helpers import use_simulated_devices

use_simulated_devices(8, quiet=True)
