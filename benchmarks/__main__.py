import os
import sys

from . import callback, jax_speed, per_example, speed

arguments = sys.argv[1:]
if os.environ.get("KERAS_BACKEND") == "jax":  # Keras 3 on JAX: timed against a jitted jax step
    sys.exit(jax_speed.main(arguments))
status = speed.main(arguments)
if "--mode" not in arguments:  # else a process of speed.main's own, for one mode
    status |= per_example.main([])
    status |= callback.main([])
sys.exit(status)
