import os
import sys

from . import callback, keras3_speed, per_example, speed

arguments = sys.argv[1:]
if os.environ.get("KERAS_BACKEND") in keras3_speed.BACKENDS:  # timed against that framework's own step
    sys.exit(keras3_speed.main(arguments))
status = speed.main(arguments)
if "--mode" not in arguments:  # else a process of speed.main's own, for one mode
    status |= per_example.main([])
    status |= callback.main([])
sys.exit(status)
