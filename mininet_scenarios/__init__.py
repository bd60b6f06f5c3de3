"""mininet_scenarios"""
