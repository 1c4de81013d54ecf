"""App secrets, the control plane's side: set once, sealed at rest, handed only to a node
starting one of the app's sandboxes (docs/design/secrets.md).

- `sealing.py`: one value sealed and opened with AES-GCM, bound to its app and name (pure).
- `rules.py`: what a change of an app's secrets may be (pure).
- `keys.py`: `KeyRing`, the keys held and the current key's id in the store; the check that
  refuses a control plane a key the store needs; placements made and verified.
- `keydir.py`: `KeyDirectory`, the key files: private, written whole, read only if regular.
- `book.py`: `SecretBook`, set, unset and list an app's secrets, and the values for a node
  starting a sandbox (`env_for`, `for_node`).
- `rotation.py`: a new key, and every value sealed again under it, without a restart.
- `api.py`: the routes of the control API.
- `errors.py`: what they raise.
"""
