"""The infer stage's parts: settings, the chat-completions client, the resumable journal.

`remote.stages.infer` puts them together; each module here is usable alone
(the benchmark drives `client` directly).
"""
