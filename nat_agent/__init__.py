"""nat_agent"""
