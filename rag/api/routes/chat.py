"""Routes of this area are added here."""

from fastapi import APIRouter

router = APIRouter()
