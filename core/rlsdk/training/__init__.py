"""Training (internal): the trainer protocol and its call point, the torch trainer, losses and advantage
estimators, weight sync to the engines and the trust check. Plugin authors import the public names from
``rlsdk`` (``rlsdk.trainer_api.PolicyTrainer``, ``rlsdk.log_probs_and_entropy``, ...)."""

from .. import _moved

__getattr__ = _moved.forward(__name__, {"PolicyTrainer": "rlsdk.trainer_api"})
