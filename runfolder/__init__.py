"""The run folder's contract, the ground floor every process stands on.

A run is a folder in an object store (``s3://B/runs/ID``, ``gs://B/runs/ID`` or ``file:///…``).
This package owns what that folder is and how it is read: its layout and names
(:mod:`runfolder.layout`), the store that holds it (:mod:`runfolder.storage`), the one-writer
lease (:mod:`runfolder.lease`), the process exit codes (:mod:`runfolder.exits`), the
``TRAINSTACK_*`` variables the processes hand one another (:mod:`runfolder.environment`), the event
contract and its readers (:mod:`runfolder.events`), the committed checkpoints as a reader sees
them (:mod:`runfolder.checkpoints`), and what a run cost (:mod:`runfolder.cost`).

The trainer writes a run, the controller and ``ops`` read and mark it, the stack sets up its
bucket rules: each imports this package, and this package imports none of them.
"""
