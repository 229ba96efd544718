"""The host side of aerie: shipped to the GPU host by `inv deploy` and run there.

Everything the control plane needs (`wire`, `states`, `jobs`, `supervisor`,
`progress`, `release`) uses the standard library only, because the host's
Python may have nothing else installed. The stages under `remote.stages` may
import `datasets`, `transformers` and `torch`, which the host provides.
"""
