"""The placement controller's simulated world: stand-ins for the store, the groups, the machines and the clock.

The controller's own code makes every decision in it (:mod:`simworld.world`); ``python -m controller.replay``
drives it by a price trace (:mod:`simworld.replay`); the tests' simulator (``tests/controller/sim.py``) by seeded
random schedules. It ships with the project, outside the controller's function package
(components/function_package.py), which stays the controller and the run folder alone.
"""
