"""What a deploy, a rollback or an app's deletion is refused with: a message a person can act
on, which the control API answers as a 4xx (`api.py`).

    DeployError     refused: a host taken or reserved, no previous version, an artifact
     │              never uploaded, a record that kept changing, ...
     └── UnknownApp no app of that name (404)
"""


class DeployError(ValueError):
    pass


class UnknownApp(DeployError):
    pass
