"""Selectors: reads of engine state for people and pages. They change no row; the one write a
person's read makes is its own audit row (R19). Changes go through ``workers.services``.
"""
