import sys

from . import callback, per_example, speed

arguments = sys.argv[1:]
status = speed.main(arguments)
if "--mode" not in arguments:  # else a process of speed.main's own, for one mode
    status |= per_example.main([])
    status |= callback.main([])
sys.exit(status)
