"""The workstation side of aerie: inventories, transports, deploy, jobs, views.

`local` reaches the host only through `remote`'s command line and the tagged
JSON it prints (`remote.vocabulary.wire`), the same way over SSH and on this machine.
"""
