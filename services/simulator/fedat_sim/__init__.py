"""FedAT in virtual time: the production services over an in-memory broker and a discrete-event clock."""

from fedat_sim.simulate import simulate

__all__ = ["simulate"]
