"""The tuning lab: charts and interactive widgets over simulation results and sweeps."""
