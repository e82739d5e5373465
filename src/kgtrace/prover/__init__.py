"""A neuro-symbolic prover over a dataset's facts and Horn rules, ranked like the embedding models.

logic      atoms, states, terms; EngineShapes          rules      rule files (two formats)
mining     AMIE-style rule mining (sparse products)    reference  readable SLD resolution and search
engine     the vectorised fixed-shape step             search     breadth-first search on the engine
env        the functional environment, rollouts, beams policy     the learned policy and its scorer
ppo        PPO training (kgtrace prove train)          scorer     BFS and hybrid scorers
run        prover run folders                          explain    proofs step by step
hybrid     a hybrid's weight chosen on validation (kgtrace prove weigh)
setup      a run's dataset, rules and config from keyword settings (kgtrace prove)
link       NTP-lambda's link head: ComplEx on the policy's own embeddings, trained beside PPO
graph      the training graph's directed relations as sparse matrices, for walks
learn      AnyBURL's path rules learned from sampled paths, anytime (kgtrace rules learn)
apply      rule application: every entity ranked by the rules predicting it (kgtrace prove apply)
apply_reference  the same, grounded by backtracking one query at a time
"""
